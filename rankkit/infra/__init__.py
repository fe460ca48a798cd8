"""Infrastructure, apart from the maths: argument checks, safe file writes, YAML, quiet Lightning
runs, guarded checkpoint loading and the fit progress line. Internal: not part of rankkit's API.

Nothing here imports a model; the models, the data layer and the command line all import it.
"""
