import pickle, sys
OPT = 25.3203605254718
OPTS = dict(tp=4, pp=1, speculative=True, num_speculative_tokens=1, chunked_prefill=True, block_size=16, cuda_graphs=True, prefix_caching=True)
def run(variant, seed, sigma="0.2"):
    d = pickle.load(open(f"/tmp/fid_out/{variant}/llm_serving_{sigma}_{seed}.pkl", "rb"))
    best = 0
    for t in d["detail"]:
        ua = t["user_attrs"]; p = t["params"]
        is_opt = all(p.get(k) == v for k, v in OPTS.items())
        det = ua.get("autoscout:sim_error_detail") or {}
        if is_opt:
            est = ua.get("autoscout:estimate") or 0
            sc = det.get("scale"); re = det.get("relative_error")
            thr = None
            if sc and re is not None: thr = est*sc*(1+re)/OPT
            print(f"  #{t['number']} {t['state']:8} arm={ua.get('autoscout:arm'):8} true {ua.get('dbg_true',0)/OPT:.3f} est {est/OPT:.3f} sim {ua.get('autoscout:simulated',0)/OPT:.3f} scale {sc} relerr {re} -> est*sc*(1+re) {thr} vs best_real {best/OPT:.3f} [{ua.get('autoscout:fidelity_reason')}]")
        if t["state"] == "COMPLETE":
            best = max(best, t["value"])
for s in sys.argv[2:]:
    print("seed", s); run(sys.argv[1], int(s))
