"""Key counters per kernel from ``ncu --import REP --page raw --csv`` (stdin): time, DRAM and L2
traffic, occupancy, instructions and the largest stall reasons per issued instruction."""
import csv
import sys

KEYS = {"gpu__time_duration.sum": "us", "dram__bytes_read.sum": "dram_rd",
        "dram__bytes_write.sum": "dram_wr",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
        "lts__t_sector_hit_rate.pct": "l2hit%", "lts__t_bytes.sum": "l2_bytes",
        "sm__warps_active.avg.pct_of_peak_sustained_active": "occ%",
        "smsp__inst_executed.sum": "inst", "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue%",
        "launch__registers_per_thread": "regs", "launch__grid_size": "grid",
        "launch__occupancy_limit_registers": "lim_reg", "launch__occupancy_limit_shared_mem": "lim_smem"}
STALL = "smsp__average_warps_issue_stalled_"
rows = list(csv.reader(sys.stdin))
head, units, data = rows[0], rows[1], rows[2:]
col = {name: i for i, name in enumerate(head)}
for r in data:
    name = next((r[col[c]] for c in ("NVTX Range", "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg")
                 if c in col), "")
    kernel = r[col["Kernel Name"]][:60] if "Kernel Name" in col else ""
    vals = {}
    for k, short in KEYS.items():
        if k in col:
            vals[short] = r[col[k]] + ("" if units[col[k]] in ("", "none") else units[col[k]])
    stalls = sorted(((float(r[i].replace(",", "") or 0), h[len(STALL):].replace("_per_issue_active.ratio", ""))
                     for i, h in enumerate(head) if h.startswith(STALL) and h.endswith("_per_issue_active.ratio")
                     and r[i]), reverse=True)[:7]
    print(name, "|", kernel)
    print("   ", " ".join(f"{k}={v}" for k, v in vals.items()))
    print("    stalls/issue:", " ".join(f"{n}={v:.2f}" for v, n in stalls))
