import pickle, sys, collections
import numpy as np
sys.path.insert(0, "/tmp/fid")
OPT = 25.3203605254718
STRUCT = ("tp", "pp", "block_size", "chunked_prefill", "cuda_graphs", "prefix_caching", "speculative", "num_speculative_tokens")
def skey(p):
    return tuple((k, p[k]) for k in STRUCT if k in p)
def show(variant, seed, sigma="0.2", study="llm_serving", verbose=True):
    d = pickle.load(open(f"/tmp/fid_out/{variant}/{study}_{sigma}_{seed}.pkl", "rb"))
    det = d["detail"]
    # best true per structure seen (via dbg_true for all trials)
    per = collections.defaultdict(list)
    for t in det:
        tv = t["user_attrs"].get("dbg_true")
        if tv is None: tv = t["user_attrs"].get("true_value")
        per[skey(t["params"])].append((t["number"], t["state"], tv, t["user_attrs"].get("autoscout:estimate"), t["user_attrs"].get("autoscout:fidelity_reason"), t["user_attrs"].get("autoscout:arm")))
    best_real = max((t["user_attrs"].get("true_value", 0) for t in det if t["state"] == "COMPLETE"), default=0)
    print(f"seed {seed}: best real true {best_real/OPT:.3f}, trials {len(det)}, real {sum(t['state']=='COMPLETE' for t in det)}")
    rank = sorted(per.items(), key=lambda kv: -max((x[2] or 0) for x in kv[1]))
    for s, lst in rank[:6]:
        mx = max((x[2] or 0) for x in lst)
        real = [x for x in lst if x[1] == "COMPLETE"]
        print(f"  {dict(s)} n={len(lst)} real={len(real)} best_true_seen={mx/OPT:.3f} best_real={max([x[2] for x in real], default=0)/OPT:.3f}")
        if verbose:
            for x in lst[:12]:
                print(f"     #{x[0]} {x[1]:8} true {((x[2] or 0)/OPT):.3f} est {((x[3] or 0)/OPT):.3f} {x[4]} {x[5]}")
if __name__ == "__main__":
    for s in sys.argv[2:]:
        show(sys.argv[1], int(s))
