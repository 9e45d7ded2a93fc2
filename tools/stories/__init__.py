"""Scripted stories on the local stack (``tools/localstack``), one module per story, shared by
the e2e tests and ``make demo`` so that the demo a user runs is what CI checks."""
