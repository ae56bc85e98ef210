"""Remote engine cores behind the manifest's contract: any OpenAI-compatible endpoint, or vLLM or llama.cpp's
llama-server started here.

endpoint.py (EndpointEngine), completions_stream.py (the request it sends, the stream it reads),
endpoint_scoring.py, identity.py (what the remote says it is), own_loop.py, vllm_args.py, vllm_process.py
and vllm_backend.py (VllmEngine); gguf_header.py, llamacpp_args.py, llamacpp_process.py, llamacpp_requests.py
and llamacpp_backend.py (LlamaCppEngine; docs/llamacpp.md).
"""
