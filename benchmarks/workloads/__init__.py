"""Workloads for the goodput benchmark harness: public traces read into one request type
(traces.py), and the prompt text built for them (text.py)."""
