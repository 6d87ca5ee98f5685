"""Experiments run with hyflash: their scripts, commands and the results a reader needs (see README.md).

Run from the repository root (`python -m experiments.reopold ...`). The library (hyflash/) never imports
this package.
"""
