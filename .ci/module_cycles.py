#!/usr/bin/env python3
"""Fails when modules of src/ import each other in a cycle (each file is a module; test-only code
and comments are not counted). Run from the repository root; prints each cycle and its edges."""
import re,glob,sys
files=glob.glob('src/**/*.rs',recursive=True)
def modname(f):
    m=f[4:-3].replace('/mod','')
    return m.replace('/','::')
mods={modname(f):f for f in files}
edges={}
for m,f in mods.items():
    s=open(f).read()
    # drop test-only code: #[cfg(test)] mod blocks and #[cfg(test)] items
    i=s.find('#[cfg(test)]\nmod tests')
    if i>=0: s=s[:i]
    s=re.sub(r'#\[cfg\(test\)\][^\n]*\n[^\n]*\n','',s)
    s=re.sub(r'//[^\n]*','',s)
    deps=set(); parts=m.split('::')
    isdir=f.endswith('mod.rs') or f=='src/lib.rs'
    for mm in re.finditer(r'\b(crate|super)((?:::\w+)+)',s):
        kind,path=mm.group(1),mm.group(2).strip(':').split('::')
        base=[] if kind=='crate' else parts[:-1]
        full=base+path
        for k in range(len(full),0,-1):
            c='::'.join(full[:k])
            if c in mods:
                if c!=m and not m.startswith(c+'::') : deps.add(c)
                break
    edges[m]=deps
G={}
for m,ds in edges.items():
    for d in ds: G.setdefault(m,set()).add(d)
sys.setrecursionlimit(10000)
idx={};low={};st=[];on=set();res=[];c=[0]
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in G.get(v,()):
        if w not in idx: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v: break
        if len(comp)>1: res.append(comp)
for v in list(G):
    if v not in idx: sc(v)
for comp in res:
    print(sorted(comp))
    for a in sorted(comp): print('  ',a,'->',sorted(x for x in G.get(a,()) if x in comp))
print('cycles:',len(res))
sys.exit(1 if res else 0)
