"""The OpenAI-compatible HTTP adapter, in four rooms: `transport` (JSON over loopback HTTP), `server`
(starting and stopping a real server), `text` (token ids through a text-only channel) and `adapter`
(the Engine contract over `/v1/completions`). See `adapter` for what it drives and reports."""

from adapters.openai_http.adapter import OpenAIHttpAdapter
from adapters.openai_http.transport import free_port, prometheus_totals

__all__ = ["OpenAIHttpAdapter", "free_port", "prometheus_totals"]
