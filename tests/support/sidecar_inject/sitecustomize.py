"""Put on a sidecar's PYTHONPATH by tests/test_sidecar_faults.py (its `inject` fixture): with
$ZD_TEST_FAULT set, the request parser the sidecar imports raises at a request carrying
`X-Boom` (a fault of zerodoc's own code) and complains 4 KB on stderr at one carrying
`X-Complain` (as a broken certificate rotation does per connection)."""
import os
if os.environ.get("ZD_TEST_FAULT"):  # a fault in zerodoc's code at one request
    import sys
    from zerodoc.exporter import fastpath
    real = fastpath.parse_head
    def parse_head(data):
        if b"X-Boom" in data:
            raise ValueError("boom")
        if b"X-Complain" in data:  # a complaint per connection, as a broken rotation's
            sys.stderr.write("zerodoc sidecar: " + "x" * 4000 + "\\n")
        return real(data)
    fastpath.parse_head = parse_head
