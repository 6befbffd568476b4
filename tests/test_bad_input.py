import json, time
def test_explore(make_server):
    t0=time.time()
    s = make_server(max_request_bytes=1024, max_records_per_request=3)
    print("start", time.time()-t0)
    c = s.client
    c.post("/v1/topics", json={"name": "t", "partitions": 2})
    def show(method, url, **kw):
        try:
            r = c.request(method, url, **kw)
        except Exception as e:
            print(method, url, "EXC", repr(e)); return
        print(method, url, "->", r.status_code, r.text[:400])
    def gen():
        yield b'{"partitions":[{"topic":"t","partition":0,"records":[{"value":"'
        yield b'x'*2000
        yield  b'"}]}]}'
    show("POST", "/v1/produce", content=gen())
    show("POST", "/v1/produce", content=b'{"partitions":[{"topic":"t","partition":0,"records":[{"value":"' + b'x'*2000+ b'"}]}]}')
    show("POST", "/v1/topics/t/records", json={"partition":0, "records":[{"value":"x"}]*4})
    show("POST", "/v1/produce", json={"partitions":[{"topic":"t","partition":0,"records":[{"value":"x"}]*2}, {"topic":"t","partition":1,"records":[{"value":"x"}]*2}]})
    show("GET", "/v1/topics/t")
    print(time.time()-t0)
