//! Circles in the file graph: its strongly connected components of two or more files.

use super::resolve::Edges;
use std::collections::{BTreeMap, BTreeSet};

/// Each circle as one line: `circle: a.rs -> b.rs (Name); b.rs -> a.rs (Other)`, listing
/// every edge between the circle's files.
pub fn circles(edges: &Edges) -> Vec<String> {
    let mut lines: Vec<String> = circle_components(edges)
        .into_iter()
        .map(|(_, line)| line)
        .collect();
    lines.sort();
    lines
}

/// Each circle's nodes, with its line as [`circles`] writes it.
pub fn circle_components(edges: &Edges) -> Vec<(BTreeSet<String>, String)> {
    let mut successors: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        successors.entry(from).or_default().push(to);
        successors.entry(to).or_default();
    }
    let mut found = Vec::new();
    for component in strongly_connected(&successors) {
        if component.len() < 2 {
            continue;
        }
        let parts: Vec<String> = edges
            .iter()
            .filter(|((from, to), _)| {
                component.contains(from.as_str()) && component.contains(to.as_str())
            })
            .map(|((from, to), names)| {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                format!("{from} -> {to} ({})", names.join(", "))
            })
            .collect();
        let nodes = component.iter().map(|node| node.to_string()).collect();
        found.push((nodes, format!("circle: {}", parts.join("; "))));
    }
    found
}

/// Tarjan's algorithm; graphs here are a few hundred files, so recursion is fine.
fn strongly_connected<'a>(successors: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<BTreeSet<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        components: Vec<BTreeSet<&'a str>>,
    }
    fn visit<'a>(node: &'a str, successors: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(node, n);
        s.low.insert(node, n);
        s.stack.push(node);
        s.on_stack.insert(node);
        for &next in &successors[node] {
            if !s.index.contains_key(next) {
                visit(next, successors, s);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = BTreeSet::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                component.insert(top);
                if top == node {
                    break;
                }
            }
            s.components.push(component);
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for &node in successors.keys() {
        if !state.index.contains_key(node) {
            visit(node, successors, &mut state);
        }
    }
    state.components
}
