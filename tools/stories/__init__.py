"""Stories on the local stack (``tools/localstack.py``) beyond its own: one module each."""
