//! A crate's module graph from its source text, and what is wrong with it: a module that
//! names an item of one of its ancestors (it imports upward: a parent is the façade over its
//! children, never their dependency), and circles between sibling modules (a dependency
//! between two modules counts as one between their top-most distinct ancestors, so a circle
//! anywhere below shows as a circle between siblings). Test modules are left out.

use crate::rust;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

pub type Module = Vec<String>;

/// The modules of the crate whose sources are in `src`, each with its code (comments,
/// strings and `#[cfg(test)]` items blanked).
pub fn modules(src: &Path) -> BTreeMap<Module, String> {
    crate::files(src, ".rs")
        .into_iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(&f).ok()?;
            Some((rust::module_of(src, &f), rust::without_tests(&rust::code_only(&text))))
        })
        .filter(|(m, _)| !m.iter().any(|s| s == "tests"))
        .collect()
}

/// A module naming an item of its ancestor: (module, ancestor, the path as written).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Upward {
    pub module: String,
    pub ancestor: String,
    pub path: String,
}

/// What the graph of `mods` gets wrong.
#[derive(Debug, Default)]
pub struct Findings {
    pub upward: BTreeSet<Upward>,
    /// Each circle's modules, sorted.
    pub circles: Vec<Vec<String>>,
    /// Sibling → siblings it depends on (for a picture of the graph).
    pub edges: BTreeMap<Module, BTreeSet<Module>>,
}

pub fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Resolves each path every module names to the deepest module it reaches.
pub fn check(mods: &BTreeMap<Module, String>) -> Findings {
    let mut f = Findings::default();
    for (m, code) in mods {
        for p in rust::paths(code) {
            let Some(target) = resolve(mods, m, &p) else { continue };
            if &target == m {
                continue;
            }
            if m.starts_with(&target) {
                let path = p.join("::");
                f.upward.insert(Upward { module: name(m), ancestor: name(&target), path });
                continue;
            }
            let common = m.iter().zip(&target).take_while(|(a, b)| a == b).count();
            f.edges.entry(m[..=common].to_vec()).or_default().insert(target[..=common].to_vec());
        }
    }
    f.circles = circles(&f.edges);
    f
}

/// The deepest module of `mods` that `path` (named in `from`) reaches.
fn resolve(mods: &BTreeMap<Module, String>, from: &Module, path: &[String]) -> Option<Module> {
    let (first, rest) = path.split_first()?;
    let mut at: Module = match first.as_str() {
        "crate" => Vec::new(),
        "self" => from.clone(),
        _ => from[..from.len().checked_sub(1)?].to_vec(),
    };
    let mut segs = rest.iter().peekable();
    while segs.peek().is_some_and(|s| *s == "super") {
        at.pop()?;
        segs.next();
    }
    for s in segs {
        let mut next = at.clone();
        next.push(s.clone());
        if !mods.contains_key(&next) {
            break;
        }
        at = next;
    }
    Some(at)
}

/// Strongly connected components of more than one module (Tarjan's algorithm).
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, (usize, usize)>,
        stack: Vec<&'a Module>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            self.index.insert(v, (self.next, self.next));
            self.next += 1;
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flatten() {
                match self.index.get(w).copied() {
                    None => {
                        self.visit(w);
                        let low = self.index[w].1.min(self.index[v].1);
                        self.index.entry(v).and_modify(|e| e.1 = low);
                    }
                    Some((wi, _)) if self.stack.contains(&w) => {
                        let low = wi.min(self.index[v].1);
                        self.index.entry(v).and_modify(|e| e.1 = low);
                    }
                    Some(_) => {}
                }
            }
            let (vi, vl) = self.index[v];
            if vi == vl {
                let at = self.stack.iter().rposition(|m| *m == v).unwrap_or(0);
                let comp: Vec<&Module> = self.stack.drain(at..).collect();
                if comp.len() > 1 {
                    let mut names: Vec<String> = comp.iter().map(|m| name(m)).collect();
                    names.sort();
                    self.out.push(names);
                }
            }
        }
    }
    let mut walk = Walk { edges, index: BTreeMap::new(), stack: Vec::new(), next: 0, out: Vec::new() };
    let all: BTreeSet<&Module> = edges.keys().chain(edges.values().flatten()).collect();
    for v in all {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.out.sort();
    walk.out
}

/// The graph as a Mermaid flowchart: the crate's top-level modules and their dependencies,
/// and inside each module named in `expand`, its children and theirs. Deterministic, so a
/// copy checked into the docs can be compared with the code.
pub fn mermaid(f: &Findings, expand: &[&str]) -> String {
    let id = |m: &Module| if m.is_empty() { "crate".to_string() } else { m.join("_") };
    let mut out = String::from("flowchart LR\n");
    let level = |parent: &Module| -> Vec<(&Module, &BTreeSet<Module>)> {
        f.edges.iter().filter(|(m, _)| m.len() == parent.len() + 1 && m.starts_with(parent)).collect()
    };
    let mut nodes: BTreeSet<Module> = BTreeSet::new();
    let mut lines = Vec::new();
    for (from, tos) in level(&Vec::new()) {
        nodes.insert(from.clone());
        for to in tos {
            nodes.insert(to.clone());
            lines.push(format!("    {} --> {}", id(from), id(to)));
        }
    }
    for top in expand {
        let parent: Module = vec![top.to_string()];
        out.push_str(&format!("    subgraph {}_inner [{top}]\n", id(&parent)));
        let mut inner: BTreeSet<&Module> = BTreeSet::new();
        for (from, tos) in level(&parent) {
            inner.insert(from);
            for to in tos {
                inner.insert(to);
                lines.push(format!("    {} --> {}", id(from), id(to)));
            }
        }
        for m in inner {
            out.push_str(&format!("        {}[{}]\n", id(m), m.last().map(String::as_str).unwrap_or("")));
        }
        out.push_str("    end\n");
    }
    for n in &nodes {
        out.push_str(&format!("    {}[{}]\n", id(n), name(n)));
    }
    lines.sort();
    lines.dedup();
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> BTreeMap<Module, String> {
        files
            .iter()
            .map(|(m, code)| (m.split("::").filter(|s| !s.is_empty()).map(String::from).collect(), code.to_string()))
            .collect()
    }

    #[test]
    fn a_child_naming_its_parents_item_imports_upward() {
        let mods = crate_of(&[("", ""), ("store", "pub struct S;"), ("store::db", "use super::S;")]);
        let f = check(&mods);
        assert_eq!(f.upward.len(), 1, "{f:?}");
        assert_eq!(f.upward.iter().next().map(|u| u.ancestor.as_str()), Some("store"));
    }

    #[test]
    fn a_child_naming_its_sibling_through_super_is_sideways() {
        let mods = crate_of(&[("", ""), ("store", ""), ("store::db", "use super::rows::Row;"), ("store::rows", "")]);
        let f = check(&mods);
        assert!(f.upward.is_empty() && f.circles.is_empty(), "{f:?}");
        assert!(f.edges[&vec!["store".to_string(), "db".to_string()]].contains(&vec!["store".into(), "rows".into()]));
    }

    #[test]
    fn a_circle_below_shows_between_the_siblings_above() {
        let mods = crate_of(&[
            ("", ""),
            ("a", ""),
            ("a::x", "use crate::b::y::T;"),
            ("b", ""),
            ("b::y", "use crate::a::x::U;"),
            ("c", "use crate::a::x::U;"),
        ]);
        let f = check(&mods);
        assert_eq!(f.circles, vec![vec!["a".to_string(), "b".to_string()]], "{f:?}");
    }
}
