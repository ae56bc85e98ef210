"""The model the reference engine runs: weight loading, the paged model runner and its KV memory, sampling.

weights.py, quantization.py, cpu_linear.py and onednn_linear.py (CPU kernels), model_runner.py, paged_attention.py,
compiled_decode.py, kv_memory.py, sampling.py and embedding.py (`task: embed`).
"""
