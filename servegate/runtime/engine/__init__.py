"""The engine: the interface every caller uses, and servegate's own in-process engine behind it.

interface.py     the Engine protocol every backend implements (its requests and events: runtime/types.py)
reference.py     ReferenceEngine: lifecycle and the Engine API, put together from the modules below
parts.py         what it is made of (model runner, tokenizer, scheduler, caches), typed by part_types.py
request_table.py the requests inside it and the one lock; request_state.py one request; delivery.py its events
admission.py     a request's way in (cache, contract, deadline, queue bound); endings.py its way out
loop.py          the loop thread's steps; step_sampling.py the next tokens; step_trace.py a record of each step
fallback_route.py a request the failure policy hands to the fallback engine, served there whole
loop_jobs.py, prompt_scoring.py, embeddings.py, stats.py, offline.py (`gate run`)
"""
