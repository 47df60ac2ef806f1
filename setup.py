from setuptools import setup  # the metadata is in pyproject.toml; this shim serves tools that still call setup.py

setup()
