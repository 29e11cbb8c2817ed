"""vegeta, an outside load generator, built from source (build.py)."""
