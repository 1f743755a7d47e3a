"""kerascope's benchmark suite: named scenarios, shared timing, results as data.

Run it from the repository root::

    python -m bench --list                 # every scenario, one line each
    python -m bench SCENARIO [SCENARIO...]  # run them; results go to bench/results/*.json
"""
