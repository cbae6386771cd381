"""Analysis of trained models: what the positional gates learned."""
