import redis
def test_redis(redis_server):
    r = redis.Redis.from_url(redis_server.url)
    assert r.ping()
    import pytest
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(redis_server.url_without_password).set("a", 1)
    redis_server.stop(); redis_server.start()
    assert redis.Redis.from_url(redis_server.url).ping()
