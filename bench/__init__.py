"""`make bench`: gpufrac's admission webhook and node agent measured beside a do-nothing baseline.

python -m bench [--quick | --smoke] [--skip SECTION ...] [--out bench/results.md]
"""
