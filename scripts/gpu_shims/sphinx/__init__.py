"""The lent image holds an empty `sphinx` folder, which imports as a namespace package: libraries that
probe for Sphinx with `import sphinx` then fail on `sphinx.ext`. A regular package found first on the
path wins over a namespace, so this one makes the probe say what is true: Sphinx is not installed."""

raise ModuleNotFoundError("sphinx is not installed (the gpu-check stand-in hides the image's empty sphinx folder)")
