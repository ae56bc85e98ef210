"""The failure policy (the sixth element): what overload, a passed deadline or a failure mean for a request.

outcomes.py decides (every engine and the capacity simulator call it); shared_cores.py gives the fallback
engine the CPU cores the primary leaves. The route that hands a request to the fallback engine holds an Engine,
so it sits above, in engine/fallback_route.py.
"""
