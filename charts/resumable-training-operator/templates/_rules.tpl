{{/*
Namespaced rules of the operator ("-jobs" ClusterRole or per-namespace Role); they mirror
JOB_RULES in operator/rtj_operator/api/rbac.py.
*/}}
{{- define "rtj.jobRules" -}}
# The jobs themselves (the operator never writes their spec).
- apiGroups: ["resumable.dev"]
  resources: ["resumabletrainingjobs"]
  verbs: ["get", "list", "watch"]
# Status is the operator's record of truth.
- apiGroups: ["resumable.dev"]
  resources: ["resumabletrainingjobs/status"]
  verbs: ["patch"]
# The objects made for a job (pods, Service, ServiceAccount, Role, RoleBinding, PodGroup) name it
# as their owner with blockOwnerDeletion: the OwnerReferencesPermissionEnforcement admission
# plugin requires this verb for that.
- apiGroups: ["resumable.dev"]
  resources: ["resumabletrainingjobs/finalizers"]
  verbs: ["update"]
# The gang: create ranks, delete an interrupted gang, write the preemption notice.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The headless Service that gives rank 0 its MASTER_ADDR; its port follows spec.masterPort.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch"]
# One gang-scheduled PodGroup per attempt where the cluster serves the API; read first, as its
# name may still be held by the group of a deleted job of the same name.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "create", "delete"]
# The Admitted condition of a job with spec.queueName: why Kueue keeps its gang waiting.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get"]
# Which ClusterQueue an elastic job's spec.queueName submits to: its free quota sizes the gang.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["localqueues"]
  verbs: ["get"]
# Each job's own ServiceAccount for its ranks.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create"]
# Lets the ranks patch their own pods' progress annotation, and nothing else; the Role's rules
# move to each new attempt's pods, its RoleBinding never changes.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["get", "create"]
# An Event for every interruption and resubmission (kopf posts its own as core Events too).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if and .Values.peering.enabled (not (include "rtj.clusterwide" .)) }}
# kopf peering between replicas (namespaces mode: one KopfPeering per watched namespace).
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
