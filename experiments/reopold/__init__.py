"""The REOPOLD vs OPD experiments (docs/reopold.md): `python -m experiments.reopold --help`."""
