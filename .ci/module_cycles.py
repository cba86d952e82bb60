#!/usr/bin/env python3
"""Fails when modules of src/ import each other in a cycle (each file is a module; test-only code
and comments are not counted; grouped imports, `use crate::{a, b::{c, d}}`, count each path). Run from the repository root; prints each cycle and its edges."""
import re,glob,sys
files=glob.glob('src/**/*.rs',recursive=True)
def modname(f):
    m=f[4:-3].replace('/mod','')
    return m.replace('/','::')
mods={modname(f):f for f in files}
def group_items(text,i):
    """The items of the brace group opening at text[i] ('{'), split at its top-level commas,
    and the index after its closing brace."""
    depth=0; items=[]; cur=''
    for j in range(i,len(text)):
        ch=text[j]
        if ch=='{':
            depth+=1
            if depth==1: continue
        elif ch=='}':
            depth-=1
            if depth==0:
                items.append(cur); return items,j+1
        elif ch==',' and depth==1:
            items.append(cur); cur=''; continue
        cur+=ch
    return items,len(text)
def expand(prefix,text):
    """Every path a use tree names: `a::{b, c::{d}}` gives a::b, a::c::d."""
    text=re.sub(r'\s+as\s+\w+','',text)
    text=re.sub(r'\s+','',text)
    if not text or text=='self': return [prefix]
    m=re.match(r'^((?:\w+::)*)\{',text)
    if m:
        head=[x for x in m.group(1).split('::') if x]
        items,_=group_items(text,len(m.group(1)))
        out=[]
        for it in items: out+=expand(prefix+head,it)
        return out
    return [prefix+[x for x in text.split('::') if x and x not in ('*','self')]]
def paths(s):
    """(crate|super, path) of every crate:: or super:: path, grouped imports expanded."""
    out=[]
    for mm in re.finditer(r'\b(crate|super)::\{',s):
        items,_=group_items(s,mm.end()-1)
        for it in items:
            for p in expand([],it): out.append((mm.group(1),p))
    for mm in re.finditer(r'\b(crate|super)((?:::\w+)+)(::\{)?',s):
        head=mm.group(2).strip(':').split('::')
        if mm.group(3):
            items,_=group_items(s,mm.end()-1)
            for it in items:
                for p in expand(head,it): out.append((mm.group(1),p))
        else:
            out.append((mm.group(1),head))
    return out
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
    for kind,path in paths(s):
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
