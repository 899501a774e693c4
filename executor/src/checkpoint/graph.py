"""Which names must be pickled together: the module `_flowrepl_checkpoint_graph` (part of the
checkpoint package, see store.py). Names whose pickles share objects, or whose references to
each other run in a circle, form one group, so that sharing survives and a restore can load
every group after the groups it refers to. Unit tests:
executor/tests/python/test_checkpoint_graph.py.
"""


def cycles(starts, edges):
    """The strongly connected components with more than one name among the names reachable
    from `starts` (Tarjan's algorithm, without recursion)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in starts:
        if root in index:
            continue
        work = [(root, iter(edges(root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges(nxt))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    scc.append(x)
                    if x == node:
                        break
                if len(scc) > 1:
                    found.append(scc)
    return found


def groups(pickled):
    """`pickled`: name -> (pickle, names it refers to, ids of the objects in it whose identity
    matters). The sets of names to pickle together (each sorted): those that share an object,
    and those that refer to each other in a circle."""
    parent = {n: n for n in pickled}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner = {}
    for n, (_, _, ids) in pickled.items():
        for i in ids:
            o = owner.setdefault(i, n)
            if o != n:
                parent[find(n)] = find(o)
    for scc in cycles(list(pickled), lambda n: pickled[n][1] if n in pickled else ()):
        for x in scc[1:]:
            if x in parent and scc[0] in parent:
                parent[find(x)] = find(scc[0])
    sets = {}
    for n in pickled:
        sets.setdefault(find(n), []).append(n)
    for names in sets.values():
        names.sort()
    return list(sets.values())


def load_order(groups, where):
    """The order to load `groups` (journal entries with `refs`) in: each after the groups
    holding the names it refers to (`where`: name -> group index). The references form no
    cycle (mutual ones were saved as one group); one there anyway is broken, not followed."""
    order, done, visiting = [], set(), set()

    def visit(i):
        if i in done or i in visiting:
            return
        visiting.add(i)
        for r in groups[i]["refs"]:
            j = where.get(r)
            if j is not None:
                visit(j)
        visiting.discard(i)
        done.add(i)
        order.append(i)

    for i in range(len(groups)):
        visit(i)
    return order
