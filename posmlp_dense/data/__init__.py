"""Built-in datasets: small, generated, real files on disk (no downloads)."""
