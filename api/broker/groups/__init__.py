"""Consumer groups on the broker (the KIP-848 protocol): the group
coordinator's pure decision parts, starting with the server-side partition
assignors in ``assignors``."""
