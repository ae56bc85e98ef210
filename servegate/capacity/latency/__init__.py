"""The latency model, the simulator that predicts one policy with it, and `gate profile`, which fits it."""
