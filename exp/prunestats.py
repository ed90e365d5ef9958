import pickle, collections, sys
import numpy as np
def stats(v, study, sg, seeds):
    c = collections.Counter()
    for s in seeds:
        try: d = pickle.load(open(f"/tmp/fid_out/{v}/{study}_{sg}_{s}.pkl","rb"))
        except FileNotFoundError: continue
        best = None; maxim = True
        for t in d["detail"]:
            ua = t["user_attrs"]; arm = ua.get("autoscout:arm")
            tv = ua.get("dbg_true")
            if best is not None and tv is not None and t["state"] in ("PRUNED", "COMPLETE"):
                r = tv / best
                cat = "better" if r > 1.001 else ("near(>0.97)" if r > 0.97 else "worse")
                c[(arm, t["state"], cat)] += 1
            if t["state"] == "COMPLETE":
                best = ua["true_value"] if best is None else max(best, ua["true_value"])
    n = len(seeds)
    for k in sorted(c, key=str):
        print(f"  {v} {k}: {c[k]/n:.1f}")
if __name__ == "__main__":
    for v in sys.argv[3:]:
        stats(v, sys.argv[1], sys.argv[2], range(8))
