"""a vs a2 interleaved on copies of one template (same schema: both settles exist), 1,000 keys, 200,000 backlog:
venv/bin/python interleave.py [clients]"""
import sys
sys.path.insert(0, "/tmp/i27-proto")
import driver as d
clients = int(sys.argv[1]) if len(sys.argv) > 1 else 1
tmpl = "i27_proto_t_inter"
d.create_db(tmpl); d.apply_schema(tmpl, "a"); d.load(tmpl, "a", 200_000, 1000)
for i, layout in enumerate(["a", "a2", "a", "a2"]):
    run = f"i27_proto_r_inter_{i}"
    d.create_db(run, template=tmpl)
    r = d.relay(run, layout, clients, 20_000, 30)
    print(f"[interleaved {i + 1}: {layout}, {clients} clients] {r['rate']:,.0f} deliveries/s, claim {r['claim_ms']:.2f} ms, "
          f"settle {r['settle_ms']:.2f} ms, {r['cpu_us']:.0f} us backend CPU/delivery", flush=True)
    d.drop_db(run)
d.drop_db(tmpl)
