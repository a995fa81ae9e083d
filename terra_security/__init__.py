"""Who may talk to whom: the PKI and its roles, data-connection keys and authentication,
and the keyed flow digests (docs/security.md). Layers: docs/architecture.md."""
