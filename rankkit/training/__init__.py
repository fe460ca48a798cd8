"""The training side of the Lightning front end: the DataModule, simulated click logs to train
on, and the LightningCLI that ``rankkit fit|validate|test|predict``, ``compare`` and ``tune`` share.

It sits above the models (the click logs need the booster's production ranker) and below the
applications (the command line, ``rankkit compare``, ``rankkit tune``).
"""
