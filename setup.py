"""Package layout: ``mia_engine`` and ``kernels`` from the repository root, and ``configs/`` shipped as
``mia_engine.configs`` so that ``--config default`` works from any install, editable or not."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["mia_engine", "mia_engine.*", "kernels", "kernels.*"]) + ["mia_engine.configs"],
    package_dir={"mia_engine.configs": "configs"},
    package_data={"mia_engine.configs": ["*.toml"]},
)
