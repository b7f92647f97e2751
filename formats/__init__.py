"""The formats two programs share: the batch files and manifests the edge writes and the
central jobs read, publication ids, and the health record's fields. Imports only ``base``."""
