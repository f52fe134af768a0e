//! node.yaml's text as a tree whose every node knows its line, so each problem found later can
//! say where it is (docs/reference.md#node-configuration-nodeyaml). Built from saphyr-parser's
//! events with a stack, never recursively, and bounded: nesting deeper than node.yaml ever
//! needs and aliases that expand without end are syntax errors, not a crash.

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};
use std::borrow::Cow;
use std::collections::HashMap;

/// node.yaml nests four levels; dropping or cloning a tree recurses once per level.
const MAX_DEPTH: usize = 64;
/// Most nodes one document may hold with its aliases expanded: a few aliases naming each other
/// would otherwise expand to billions.
const MAX_NODES: usize = 100_000;

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// 1-based.
    pub line: usize,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `plain` when unquoted: only a plain scalar can be a number, a boolean or null.
    Scalar {
        text: String,
        plain: bool,
    },
    List(Vec<Node>),
    /// Entries in the file's order, keys being nodes too so a bad key has its line.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// A plain `~`, `null` or nothing at all.
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }
}

/// Where the text stops being YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl std::fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}, column {}: {}", self.line, self.column, self.message)
    }
}

fn error_at(span: Span, message: impl Into<String>) -> SyntaxError {
    SyntaxError { line: span.start.line(), column: span.start.col() + 1, message: message.into() }
}

/// The one document of `text`; an empty file is a null node on line 1.
pub fn parse(text: &str) -> Result<Node, SyntaxError> {
    let mut tree = Builder::default();
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| SyntaxError {
            line: e.marker().line(),
            column: e.marker().col() + 1,
            message: e.info().to_string(),
        })?;
        tree.on_event(event, span)?;
    }
    Ok(tree.root.unwrap_or(Node { line: 1, value: Value::Scalar { text: String::new(), plain: true } }))
}

/// A collection whose end has not come yet.
struct Open {
    node: Node,
    /// Its key while it waits for its value (mappings only).
    key: Option<Node>,
    anchor: usize,
    /// Nodes in it so far, itself included.
    size: usize,
}

#[derive(Default)]
struct Builder {
    open: Vec<Open>,
    /// Each finished anchored node with its size, for the aliases that name it.
    anchors: HashMap<usize, (Node, usize)>,
    nodes: usize,
    documents: usize,
    root: Option<Node>,
}

impl Builder {
    fn on_event(&mut self, event: Event<'_>, span: Span) -> Result<(), SyntaxError> {
        let line = span.start.line();
        match event {
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(error_at(span, "node.yaml must be a single YAML document"));
                }
            }
            Event::Scalar(text, style, anchor, tag) => {
                let plain = style == ScalarStyle::Plain && !is_str_tag(&tag, span)?;
                self.count(1, span)?;
                self.finish(Node { line, value: Value::Scalar { text: text.into_owned(), plain } }, 1, anchor, span)?;
            }
            Event::Alias(id) => {
                let (node, size) = self.anchors.get(&id).cloned().ok_or_else(|| error_at(span, "unknown anchor"))?;
                self.count(size, span)?;
                self.finish(node, size, 0, span)?;
            }
            Event::SequenceStart(anchor, tag) => {
                self.start(Node { line, value: Value::List(Vec::new()) }, anchor, &tag, span)?
            }
            Event::MappingStart(anchor, tag) => {
                self.start(Node { line, value: Value::Map(Vec::new()) }, anchor, &tag, span)?
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(done) = self.open.pop() {
                    self.finish(done.node, done.size, done.anchor, span)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn count(&mut self, n: usize, span: Span) -> Result<(), SyntaxError> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > MAX_NODES {
            return Err(error_at(span, format!("more than {MAX_NODES} values (aliases included)")));
        }
        Ok(())
    }

    fn start(&mut self, node: Node, anchor: usize, tag: &Option<Cow<'_, Tag>>, span: Span) -> Result<(), SyntaxError> {
        is_str_tag(tag, span)?;
        if self.open.len() >= MAX_DEPTH {
            return Err(error_at(span, format!("nested more than {MAX_DEPTH} levels deep")));
        }
        self.count(1, span)?;
        self.open.push(Open { node, key: None, anchor, size: 1 });
        Ok(())
    }

    /// Puts a finished node into the collection around it (or makes it the document).
    fn finish(&mut self, node: Node, size: usize, anchor: usize, span: Span) -> Result<(), SyntaxError> {
        if anchor != 0 {
            // The kept copy counts too, or anchors nested in anchors would multiply memory.
            self.count(size, span)?;
            self.anchors.insert(anchor, (node.clone(), size));
        }
        let Some(parent) = self.open.last_mut() else {
            if self.root.is_some() {
                return Err(error_at(span, "node.yaml must be a single YAML document"));
            }
            self.root = Some(node);
            return Ok(());
        };
        parent.size = parent.size.saturating_add(size);
        match &mut parent.node.value {
            Value::List(items) => items.push(node),
            Value::Map(entries) => match parent.key.take() {
                Some(key) => entries.push((key, node)),
                None => parent.key = Some(node),
            },
            Value::Scalar { .. } => {}
        }
        Ok(())
    }
}

/// Whether `tag` makes a scalar a string (`!!str`). The other core-schema tags change nothing
/// here (the field decides the type); a tag of the application's own means nothing to node.yaml.
fn is_str_tag(tag: &Option<Cow<'_, Tag>>, span: Span) -> Result<bool, SyntaxError> {
    match tag {
        None => Ok(false),
        Some(t) if t.is_yaml_core_schema() => Ok(t.suffix == "str"),
        Some(t) => Err(error_at(span, format!("the tag {t} means nothing in node.yaml"))),
    }
}
