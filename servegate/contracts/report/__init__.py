"""The check report's schema: what `gate check --json` writes and `gate note` reads, through the same types.

`check_report.py` holds the report and each gate's result, `measurements.py` and `quality_measurements.py`
each built-in gate's measurements, `quality.py` and `probes.py` the records they are made of.
"""
