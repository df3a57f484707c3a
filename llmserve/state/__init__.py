"""State shared by gateway replicas: the Redis connection (``state.redis_url``) and what lives in it."""
