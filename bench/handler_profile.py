"""Where one request's time goes inside gpufrac's Flask app (not the server): the app as `gpufrac webhook` builds
it, prometheus_client in multiprocess mode and the JSON log to /dev/null, driven by Flask's test client over the
seed reviews. Runs in its own process (prometheus_client picks its mode at import):

python -m bench.handler_profile [--rounds N]   # prints one JSON object
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time

# (label, file suffix, function name): cumulative time of these, per request
PARTS = (
    ("whole request (Flask app called by the test client)", "flask/app.py", "__call__"),
    ("gpufrac handler (`ReviewEndpoints.review`)", "gpufrac/webhook/serve/app.py", "review"),
    ("decision (admission.mutate / .validate)", "gpufrac/webhook/decide/admission.py", "mutate|validate"),
    ("JSON log line (`log.info`)", "logging/__init__.py", "info"),
    ("metrics (Counter.inc + Histogram.observe)", "prometheus_client/metrics.py", "inc|observe"),
    ("json.loads of the body", "json/__init__.py", "loads"),
    ("build_response (patch JSON + base64)", "gpufrac/webhook/decide/review.py", "build_response"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.handler_profile")
    parser.add_argument("--rounds", type=int, default=1000)
    args = parser.parse_args(argv)
    metrics_dir = tempfile.mkdtemp(prefix="bench-handler-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # before prometheus_client is imported
    import logging.config

    from bench.chart import chart_webhook
    from bench.reviews import seed_reviews
    from gpufrac.webhook.serve.app import create_app
    from gpufrac.webhook.serve.serverlog import server_log_config as _log_config

    sys.stdout = open(os.devnull, "w")  # the log handler writes here, as to a pod's stdout
    real_stdout = sys.__stdout__
    logging.config.dictConfig(_log_config("info"))
    chart = chart_webhook()
    reviews = seed_reviews(chart.policy())
    client = create_app(chart.policy()).test_client()
    headers = {"Content-Type": "application/json"}
    for _ in range(50):
        for r in reviews:
            assert client.post(r.path, data=r.raw, headers=headers).status_code == 200
    # CPU time, not wall time: on a shared machine the wall clock also counts the other processes' turns.
    t0 = time.process_time()
    for _ in range(args.rounds):
        for r in reviews:
            client.post(r.path, data=r.raw, headers=headers)
    plain_us = (time.process_time() - t0) / (args.rounds * len(reviews)) * 1e6
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(args.rounds):
        for r in reviews:
            client.post(r.path, data=r.raw, headers=headers)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    n = args.rounds * len(reviews)
    parts = []
    for label, suffix, names in PARTS:
        wanted = set(names.split("|"))
        cumulative = sum(ct for (filename, _line, func), (_cc, _nc, _tt, ct, _c) in stats.items()
                         if filename.endswith(suffix) and func in wanted)
        parts.append([label, cumulative / n * 1e6])
    print(json.dumps({"us_per_request": plain_us, "parts": parts}), file=real_stdout, flush=True)
    return 0


def run(rounds: int) -> dict | str:
    """The profile from a child process, or why it failed."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    result = subprocess.run([sys.executable, "-m", "bench.handler_profile", "--rounds", str(rounds)], cwd=root,
                            env=env, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        return f"failed: {(result.stderr or result.stdout)[-1500:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    raise SystemExit(main())
