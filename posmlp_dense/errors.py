"""The package's own exception types."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model."""
