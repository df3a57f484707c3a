"""The OpenAI API surface shared by the gateway and the instance server: request
models, their limits, safe JSON parsing and the error shape. No torch here: the
gateway imports it."""
