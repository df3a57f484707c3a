"""The gateway: one OpenAI-compatible endpoint in front of pools of engine instances.

Pure decision code (version_router, canary, admission, balancer, circuit, health)
takes data and time as arguments; the app wires it to HTTP. Never imports torch.
"""
