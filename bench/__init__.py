"""kerascope's benchmark suite: named scenarios, shared timing, results as data.

Run it from the repository root::

    python -m bench --list                   # every scenario, one line each (--tag TAG to filter)
    python -m bench SCENARIO [SCENARIO...]    # names or glob patterns; results go to bench/results/*.json
    python -m bench 'floor-*-demo-8' --repeats 3 --set cpu_time=true
    python -m bench --setup-peers            # the peer libraries' virtual environment

Scenarios live in ``bench/scenarios/``; the shared parts in ``bench/timing.py`` (rotating timing,
ratios, peak memory), ``bench/models.py``, ``bench/floor.py`` (the compiled floor) and
``bench/peer_env.py``. ``bench/HISTORY.md`` keeps the finished studies.
"""
