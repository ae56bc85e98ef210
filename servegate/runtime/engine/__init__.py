"""The engine: the interface every caller uses, and servegate's own in-process engine behind it.

interface.py (requests, events, the Engine protocol), reference.py (ReferenceEngine), parts.py (what it is
made of), request_state.py (one request inside it), step_trace.py, loop_jobs.py, prompt_scoring.py and
offline.py (`gate run`).
"""
