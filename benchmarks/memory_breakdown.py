"""Where the peak of one RL update comes from: the live tensors at the peak, by the profiler's memory category and
by the op (and module) that allocated them. The batch of ``benchmarks/memory.py``; torch's private
``_memory_profiler`` does the categorising, so this is a diagnostic, not a benchmark (docs/memory.md).

Run: ``python benchmarks/memory_breakdown.py lora_ckpt eager 1024`` (variant: full, lora, lora_ckpt).
"""

# ruff: noqa: E501, RUF005
import collections
import sys

import torch
from memory import build_update  # this folder's benchmarks/memory.py: the same model, learner and batch
from torch.profiler import ProfilerActivity, profile
from torch.profiler import _memory_profiler as mp

variant, attention = sys.argv[1], sys.argv[2]
SEQ = int(sys.argv[3]) if len(sys.argv) > 3 else 2048

torch.set_num_threads(1)
_, learner, trajs = build_update(variant, attention, SEQ)
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
    learner.update(trajs)
memp = prof._memory_profile()
tl = memp.timeline
cats = memp._categories
# attribute each tensor key to the op that allocated it
owner = {}
for node in memp._op_tree.sorted_nodes:
    if node.tag == mp._EventType.Allocation and node.extra_fields.alloc_size > 0:
        key = mp.TensorKey.from_allocation(node.extra_fields)
        if key is None:
            continue
        names = []
        p = node.parent
        aten = None
        module = None
        bw = False
        while p is not None:
            if aten is None and p.name.startswith("aten::"):
                aten = p.name
            if module is None and p.name.startswith("nn.Module:"):
                module = p.name[11:]
            if "evaluate_function" in p.name or "backward" in p.name.lower():
                bw = True
            if (
                not p.name.startswith("aten::")
                and not p.name.startswith("nn.Module")
                and "(" in p.name
                and "/torch/" not in p.name
                and "transformers/utils" not in p.name
                and "peft" not in p.name
                and len(names) < 1
                and aten is not None
            ):
                names.append(p.name.split("/")[-1])
            p = p.parent
        owner[key.id] = [("BW " if bw else "FW ") + str(aten), str(module)] + names
live = {}
cur = 0
peak = 0
peak_live = None
peak_t = None
cpu = torch.device("cpu")
for t, action, (key, version), nbytes in tl:
    if key.device != cpu:
        continue
    if action in (mp.Action.PREEXISTING, mp.Action.CREATE):
        live[(key, version)] = nbytes
        cur += nbytes
    elif action == mp.Action.INCREMENT_VERSION:
        n = live.pop((key, version), nbytes)
        live[(key, version + 1)] = n
    elif action == mp.Action.DESTROY:
        cur -= live.pop((key, version), nbytes)
    if cur > peak:
        peak = cur
        peak_live = dict(live)
        peak_t = t
pre = sum(n for t, a, kv, n in tl if a == mp.Action.PREEXISTING and kv[0].device == cpu)
print(f"{variant} {attention} seq={SEQ}: peak live tensors {peak / 2**20:.0f} MiB (pre-existing {pre / 2**20:.0f} MiB)")
bycat = collections.Counter()
for (key, version), n in peak_live.items():
    c = cats.get(key, version)
    bycat[c.name if c else "UNKNOWN"] += n
for c, n in bycat.most_common():
    print(f"  {c:<18} {n / 2**20:8.1f} MiB")
byop = collections.Counter()
cnt = collections.Counter()
sizes = {}
for (key, version), n in peak_live.items():
    o = owner.get(getattr(key, "id", None), ["?"])
    c = cats.get(key, version)
    label = f"{c.name if c else 'UNKNOWN'}: " + " | ".join(x for x in o[:3])
    byop[label] += n
    cnt[label] += 1
    sizes.setdefault(label, collections.Counter())[n] += 1
print("  largest groups at the peak (category: allocating op < parents):")
for lab, n in byop.most_common(14):
    print(
        f"  {n / 2**20:8.1f} MiB  x{cnt[lab]:<3} {lab[:140]}  sizes MiB: {[(round(k / 2**20, 1), v) for k, v in sizes[lab].most_common(3)]}"
    )
