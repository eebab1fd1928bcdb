//! Message selectors (SEL-*): the `apache.org:selector-filter:string` source filter of events
//! and events-store consume links, a JMS / SQL-92 conditional expression over a message's
//! application properties and the header fields JMS names, evaluated with SQL's three-valued
//! logic: a message is delivered only when the whole expression is TRUE (SEL-7).
//!
//! [`lexer`] makes tokens, [`parser`] an expression within [`MAX_BYTES`], [`MAX_NODES`] and
//! [`MAX_DEPTH`]; [`Selector::matches`] evaluates it over [`Operands`], which
//! [`EnvelopeOperands`] reads from the `amqp10` envelope in a KubeMQ message's Metadata.

pub mod lexer;
pub mod parser;

use std::cmp::Ordering;

use serde_json::Value as Json;

/// Longest selector text, in bytes (SEL-5).
pub const MAX_BYTES: usize = 4096;
/// Most expression nodes a selector parses to (SEL-5).
pub const MAX_NODES: usize = 64;
/// Deepest nesting of parentheses and prefix operators.
pub const MAX_DEPTH: usize = 32;

/// Why a selector is refused; its text is the DETACH description (`invalid selector: …`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selector: {reason} at position {at}")]
pub struct SelectorError {
    /// Byte offset in the selector text.
    pub at: usize,
    /// What is wrong, naming the offending token where there is one.
    pub reason: String,
}

impl SelectorError {
    fn at(at: usize, reason: &str) -> Self {
        SelectorError {
            at,
            reason: reason.to_string(),
        }
    }

    fn token(at: usize, token: &str, reason: &str) -> Self {
        // A token is shown shortened: the description stays short whatever the client sent.
        let shown: String = token.chars().take(40).collect();
        SelectorError {
            at,
            reason: format!("{reason} {shown:?}"),
        }
    }
}

/// A literal in the selector text.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// `'text'`.
    Str(String),
    /// An exact number.
    Long(i64),
    /// An approximate number.
    Double(f64),
    /// `TRUE` / `FALSE`.
    Bool(bool),
    /// `NULL`.
    Null,
}

/// Comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `=`.
    Eq,
    /// `<>`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
}

/// Arithmetic operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arith {
    /// `+`.
    Add,
    /// `-`.
    Sub,
    /// `*`.
    Mul,
    /// `/`.
    Div,
}

/// A LIKE pattern, compiled once.
#[derive(Debug, Clone)]
pub struct Like {
    regex: Option<regex::Regex>,
}

impl PartialEq for Like {
    fn eq(&self, other: &Self) -> bool {
        self.regex.as_ref().map(regex::Regex::as_str)
            == other.regex.as_ref().map(regex::Regex::as_str)
    }
}

impl Like {
    /// `%` is any run of characters, `_` one character, `escape` makes the next one literal.
    fn new(pattern: &str, escape: Option<char>) -> Like {
        let mut re = String::from("(?s)^");
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            if Some(c) == escape {
                match chars.next() {
                    Some(n) => re.push_str(&regex::escape(&n.to_string())),
                    None => re.push_str(&regex::escape(&c.to_string())),
                }
            } else if c == '%' {
                re.push_str(".*");
            } else if c == '_' {
                re.push('.');
            } else {
                re.push_str(&regex::escape(&c.to_string()));
            }
        }
        re.push('$');
        // Within MAX_BYTES a pattern always compiles; if it did not, LIKE is UNKNOWN.
        Like {
            regex: regex::Regex::new(&re).ok(),
        }
    }

    fn matches(&self, s: &str) -> Option<bool> {
        self.regex.as_ref().map(|r| r.is_match(s))
    }
}

/// A parsed selector expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A literal.
    Literal(Literal),
    /// A property or JMS header name.
    Ident(String),
    /// `a OR b`.
    Or(Box<Expr>, Box<Expr>),
    /// `a AND b`.
    And(Box<Expr>, Box<Expr>),
    /// `NOT a`.
    Not(Box<Expr>),
    /// `a op b`.
    Compare(Cmp, Box<Expr>, Box<Expr>),
    /// `a op b`, arithmetic.
    Arith(Arith, Box<Expr>, Box<Expr>),
    /// `-a`.
    Negate(Box<Expr>),
    /// `a BETWEEN low AND high`.
    Between(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `a IN (…)`.
    In(Box<Expr>, Vec<Literal>),
    /// `a LIKE 'pattern' [ESCAPE 'c']`.
    Like(Box<Expr>, Like),
    /// `a IS NULL`.
    IsNull(Box<Expr>),
}

/// A value during evaluation.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// Absent, or of a type selectors do not compare.
    Null,
    /// A boolean.
    Bool(bool),
    /// An exact number.
    Long(i64),
    /// An approximate number.
    Double(f64),
    /// A string.
    Str(String),
}

impl Val {
    fn number(&self) -> Option<f64> {
        match self {
            Val::Long(n) => Some(*n as f64),
            Val::Double(d) => Some(*d),
            _ => None,
        }
    }
}

impl From<&Literal> for Val {
    fn from(l: &Literal) -> Val {
        match l {
            Literal::Str(s) => Val::Str(s.clone()),
            Literal::Long(n) => Val::Long(*n),
            Literal::Double(d) => Val::Double(*d),
            Literal::Bool(b) => Val::Bool(*b),
            Literal::Null => Val::Null,
        }
    }
}

/// What a selector reads from a message.
pub trait Operands {
    /// The value of a property or JMS header name; [`Val::Null`] when absent.
    fn get(&self, name: &str) -> Val;
}

/// A parsed selector.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    expr: Expr,
    text: String,
}

impl Selector {
    /// Parses a selector, within the limits of SEL-5.
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        if text.len() > MAX_BYTES {
            return Err(SelectorError::at(
                MAX_BYTES,
                "selector longer than 4096 bytes",
            ));
        }
        let tokens = lexer::tokens(text)?;
        let expr = parser::parse(&tokens)?;
        Ok(Selector {
            expr,
            text: text.to_string(),
        })
    }

    /// The selector as the client wrote it.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether a message with these operands is delivered: only when the expression is TRUE.
    pub fn matches(&self, operands: &dyn Operands) -> bool {
        truth(&self.expr, operands) == Some(true)
    }
}

/// The three-valued truth of `e` (`None` is UNKNOWN).
fn truth(e: &Expr, o: &dyn Operands) -> Option<bool> {
    match e {
        Expr::Or(a, b) => match (truth(a, o), truth(b, o)) {
            (Some(true), _) | (_, Some(true)) => Some(true),
            (Some(false), Some(false)) => Some(false),
            _ => None,
        },
        Expr::And(a, b) => match (truth(a, o), truth(b, o)) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (Some(true), Some(true)) => Some(true),
            _ => None,
        },
        Expr::Not(a) => truth(a, o).map(|t| !t),
        Expr::Compare(op, a, b) => compare(*op, &value(a, o), &value(b, o)),
        Expr::Between(x, low, high) => {
            let x = value(x, o);
            let ge = compare(Cmp::Ge, &x, &value(low, o));
            let le = compare(Cmp::Le, &x, &value(high, o));
            match (ge, le) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            }
        }
        Expr::In(x, items) => {
            let x = value(x, o);
            if x == Val::Null {
                return None;
            }
            let mut unknown = false;
            for item in items {
                match compare(Cmp::Eq, &x, &Val::from(item)) {
                    Some(true) => return Some(true),
                    Some(false) => {}
                    None => unknown = true,
                }
            }
            if unknown {
                None
            } else {
                Some(false)
            }
        }
        Expr::Like(x, like) => match value(x, o) {
            Val::Str(s) => like.matches(&s),
            _ => None,
        },
        Expr::IsNull(x) => Some(value(x, o) == Val::Null),
        // A value in a condition's place: only a boolean is a truth.
        other => match value(other, o) {
            Val::Bool(b) => Some(b),
            _ => None,
        },
    }
}

fn compare(op: Cmp, a: &Val, b: &Val) -> Option<bool> {
    let ordering = match (a, b) {
        (Val::Null, _) | (_, Val::Null) => return None,
        (Val::Long(x), Val::Long(y)) => x.cmp(y),
        (Val::Str(x), Val::Str(y)) => {
            // Strings compare for equality only (SEL-8: case-sensitive).
            return match op {
                Cmp::Eq => Some(x == y),
                Cmp::Ne => Some(x != y),
                _ => None,
            };
        }
        (Val::Bool(x), Val::Bool(y)) => {
            return match op {
                Cmp::Eq => Some(x == y),
                Cmp::Ne => Some(x != y),
                _ => None,
            };
        }
        _ => match (a.number(), b.number()) {
            (Some(x), Some(y)) => x.partial_cmp(&y)?,
            // A type mismatch is UNKNOWN, never an error (SEL-7).
            _ => return None,
        },
    };
    Some(match op {
        Cmp::Eq => ordering == Ordering::Equal,
        Cmp::Ne => ordering != Ordering::Equal,
        Cmp::Lt => ordering == Ordering::Less,
        Cmp::Le => ordering != Ordering::Greater,
        Cmp::Gt => ordering == Ordering::Greater,
        Cmp::Ge => ordering != Ordering::Less,
    })
}

fn value(e: &Expr, o: &dyn Operands) -> Val {
    match e {
        Expr::Literal(l) => Val::from(l),
        Expr::Ident(name) => o.get(name),
        Expr::Negate(a) => match value(a, o) {
            Val::Long(n) => n.checked_neg().map_or(Val::Double(-(n as f64)), Val::Long),
            Val::Double(d) => Val::Double(-d),
            _ => Val::Null,
        },
        Expr::Arith(op, a, b) => arith(*op, value(a, o), value(b, o)),
        condition => match truth(condition, o) {
            Some(b) => Val::Bool(b),
            None => Val::Null,
        },
    }
}

fn arith(op: Arith, a: Val, b: Val) -> Val {
    if let (Val::Long(x), Val::Long(y)) = (&a, &b) {
        let exact = match op {
            Arith::Add => x.checked_add(*y),
            Arith::Sub => x.checked_sub(*y),
            Arith::Mul => x.checked_mul(*y),
            // Division by zero is UNKNOWN (SEL-7); exact division truncates, as in Java.
            Arith::Div if *y == 0 => return Val::Null,
            Arith::Div => x.checked_div(*y),
        };
        if let Some(n) = exact {
            return Val::Long(n);
        }
    }
    let (Some(x), Some(y)) = (a.number(), b.number()) else {
        return Val::Null;
    };
    let r = match op {
        Arith::Add => x + y,
        Arith::Sub => x - y,
        Arith::Mul => x * y,
        Arith::Div if y == 0.0 => return Val::Null,
        Arith::Div => x / y,
    };
    Val::Double(r)
}

/// A message's operands read from its `amqp10` envelope: application properties by name, and
/// the JMS header names mapped to the AMQP header and properties fields (SEL-6).
pub struct EnvelopeOperands {
    app: Option<serde_json::Map<String, Json>>,
    props: Option<serde_json::Map<String, Json>>,
}

impl EnvelopeOperands {
    /// The operands of a message whose Metadata is `metadata` (none if it is not an envelope).
    pub fn new(metadata: &str) -> EnvelopeOperands {
        let env: Option<Json> = serde_json::from_str(metadata).ok();
        let section = |name: &str| {
            env.as_ref()
                .and_then(|e| e.get("amqp10"))
                .and_then(|a| a.get(name))
                .and_then(Json::as_object)
                .cloned()
        };
        EnvelopeOperands {
            app: section("app"),
            props: section("props"),
        }
    }

    fn prop(&self, name: &str) -> Val {
        self.props
            .as_ref()
            .and_then(|p| p.get(name))
            .map_or(Val::Null, json_val)
    }
}

/// JMS header names and the envelope `props` member each reads.
const JMS_FIELDS: [(&str, &str); 9] = [
    ("JMSMessageID", "message_id"),
    ("JMSCorrelationID", "correlation_id"),
    ("JMSType", "subject"),
    ("JMSReplyTo", "reply_to"),
    ("JMSTimestamp", "creation_time"),
    ("JMSExpiration", "absolute_expiry_time"),
    ("JMSXGroupID", "group_id"),
    ("JMSXGroupSeq", "group_sequence"),
    ("JMSXUserID", "user_id"),
];

impl Operands for EnvelopeOperands {
    fn get(&self, name: &str) -> Val {
        if name == "JMSPriority" {
            // An absent priority is AMQP's default, 4.
            return match self.prop("priority") {
                Val::Null => Val::Long(4),
                v => v,
            };
        }
        if let Some((_, field)) = JMS_FIELDS.iter().find(|(jms, _)| *jms == name) {
            return match self.prop(field) {
                // Identifiers of any AMQP type read as text.
                Val::Long(n) if matches!(*field, "message_id" | "correlation_id") => {
                    Val::Str(n.to_string())
                }
                v => v,
            };
        }
        self.app
            .as_ref()
            .and_then(|a| a.get(name))
            .map_or(Val::Null, json_val)
    }
}

/// A selector value from an envelope value (ENV-10 markers read back to their AMQP type).
fn json_val(j: &Json) -> Val {
    use serde_amqp::Value as A;
    match crate::bridge::envelope::value_from_json(j) {
        A::Bool(b) => Val::Bool(b),
        A::Ubyte(n) => Val::Long(n.into()),
        A::Ushort(n) => Val::Long(n.into()),
        A::Uint(n) => Val::Long(n.into()),
        A::Ulong(n) => i64::try_from(n).map_or(Val::Double(n as f64), Val::Long),
        A::Byte(n) => Val::Long(n.into()),
        A::Short(n) => Val::Long(n.into()),
        A::Int(n) => Val::Long(n.into()),
        A::Long(n) => Val::Long(n),
        A::Float(f) => Val::Double(f.into_inner().into()),
        A::Double(d) => Val::Double(d.into_inner()),
        A::Char(c) => Val::Str(c.to_string()),
        A::String(s) => Val::Str(s),
        A::Symbol(s) => Val::Str(s.0),
        A::Timestamp(t) => Val::Long(t.milliseconds()),
        A::Uuid(u) => Val::Str(uuid::Uuid::from_bytes(*u.as_inner()).to_string()),
        _ => Val::Null,
    }
}

#[cfg(test)]
mod tests;
