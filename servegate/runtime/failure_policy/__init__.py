"""The failure policy (the sixth element): what overload, a passed deadline or a failure mean for a request.

outcomes.py decides (every engine and the capacity simulator call it); fallback.py hands a request to the
fallback engine; shared_cores.py gives that engine the CPU cores the primary leaves.
"""
