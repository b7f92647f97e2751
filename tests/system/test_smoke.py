import asyncio

from harness.wamp_client import TRANSPORTS


async def test_pubsub_and_rpc_roundtrip_on_every_transport(client):
    for transport in TRANSPORTS:
        for ser in ("json", "msgpack", "cbor"):
            sub = await client(transport, ser)
            pub = await client("websocket", "json")
            got = asyncio.get_running_loop().create_future()
            await sub.subscribe(lambda *a, got=got, **kw: got.set_result((a, kw)), "com.t")
            pub.publish("com.t", 1, x=2)
            assert await asyncio.wait_for(got, 2) == ((1,), {"x": 2})
            await sub.register(lambda a, b: a + b, f"com.add.{transport}.{ser}")
            assert await pub.call(f"com.add.{transport}.{ser}", 2, 3) == 5
