"""Adapters that plug kdispatch's ops into serving engines (``kdispatch.integrations.vllm``)."""
