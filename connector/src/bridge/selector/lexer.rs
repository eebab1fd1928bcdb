//! Selector tokens: SQL-92 literals and operators as JMS message selectors write them.
//! Keywords are case-insensitive; identifiers and strings are case-sensitive.

use super::SelectorError;

/// One token and the byte offset where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// What it is.
    pub kind: Tok,
    /// Byte offset in the selector text.
    pub at: usize,
}

/// Token kinds.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// A property or header name.
    Ident(String),
    /// `'text'`, with `''` for a quote.
    Str(String),
    /// An exact number.
    Long(i64),
    /// An approximate number.
    Double(f64),
    /// A keyword (upper-cased).
    Keyword(Keyword),
    /// `=`, `<>`, `<`, `<=`, `>`, `>=`, `+`, `-`, `*`, `/`, `(`, `)`, `,`.
    Punct(&'static str),
    /// The end of the text.
    End,
}

/// Reserved words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyword {
    /// `AND`.
    And,
    /// `OR`.
    Or,
    /// `NOT`.
    Not,
    /// `BETWEEN`.
    Between,
    /// `LIKE`.
    Like,
    /// `ESCAPE`.
    Escape,
    /// `IN`.
    In,
    /// `IS`.
    Is,
    /// `NULL`.
    Null,
    /// `TRUE`.
    True,
    /// `FALSE`.
    False,
}

fn keyword(word: &str) -> Option<Keyword> {
    Some(match word.to_ascii_uppercase().as_str() {
        "AND" => Keyword::And,
        "OR" => Keyword::Or,
        "NOT" => Keyword::Not,
        "BETWEEN" => Keyword::Between,
        "LIKE" => Keyword::Like,
        "ESCAPE" => Keyword::Escape,
        "IN" => Keyword::In,
        "IS" => Keyword::Is,
        "NULL" => Keyword::Null,
        "TRUE" => Keyword::True,
        "FALSE" => Keyword::False,
        _ => return None,
    })
}

const PUNCT: [&str; 13] = [
    "<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",",
];

/// Splits `text` into tokens, ending with [`Tok::End`].
pub fn tokens(text: &str) -> Result<Vec<Token>, SelectorError> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(at, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let rest = text.get(at..).unwrap_or_default();
        if c == '\'' {
            chars.next();
            let mut s = String::new();
            loop {
                match chars.next() {
                    Some((_, '\'')) => {
                        if matches!(chars.peek(), Some((_, '\''))) {
                            chars.next();
                            s.push('\'');
                        } else {
                            break;
                        }
                    }
                    Some((_, c)) => s.push(c),
                    None => return Err(SelectorError::at(at, "unterminated string")),
                }
            }
            out.push(Token {
                kind: Tok::Str(s),
                at,
            });
        } else if c.is_ascii_digit()
            || (c == '.' && rest[1..].starts_with(|d: char| d.is_ascii_digit()))
        {
            let len = number_len(rest);
            let lit = &rest[..len];
            for _ in lit.chars() {
                chars.next();
            }
            out.push(Token {
                kind: number(lit).ok_or_else(|| SelectorError::token(at, lit, "bad number"))?,
                at,
            });
        } else if c.is_alphabetic() || c == '_' || c == '$' {
            let len = rest
                .char_indices()
                .find(|(_, c)| !(c.is_alphanumeric() || *c == '_' || *c == '$'))
                .map_or(rest.len(), |(i, _)| i);
            let word = &rest[..len];
            for _ in word.chars() {
                chars.next();
            }
            let kind = match keyword(word) {
                Some(k) => Tok::Keyword(k),
                None => Tok::Ident(word.to_string()),
            };
            out.push(Token { kind, at });
        } else if let Some(p) = PUNCT.iter().find(|p| rest.starts_with(**p)) {
            for _ in p.chars() {
                chars.next();
            }
            out.push(Token {
                kind: Tok::Punct(p),
                at,
            });
        } else {
            return Err(SelectorError::token(
                at,
                &c.to_string(),
                "unexpected character",
            ));
        }
    }
    out.push(Token {
        kind: Tok::End,
        at: text.len(),
    });
    Ok(out)
}

/// Length of the numeric literal at the front of `s` (digits, a fraction, an exponent, hex,
/// and a type suffix).
fn number_len(s: &str) -> usize {
    let b = s.as_bytes();
    let at = |i: usize| b.get(i).copied();
    let run = |from: usize, f: fn(&u8) -> bool| {
        b.get(from..)
            .map_or(0, |r| r.iter().take_while(|c| f(c)).count())
    };
    if at(0) == Some(b'0') && matches!(at(1), Some(b'x' | b'X')) {
        let n = 2 + run(2, u8::is_ascii_hexdigit);
        return n + usize::from(matches!(at(n), Some(b'l' | b'L')));
    }
    let mut i = run(0, u8::is_ascii_digit);
    if at(i) == Some(b'.') {
        i += 1;
        i += run(i, u8::is_ascii_digit);
    }
    if matches!(at(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(at(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let digits = run(j, u8::is_ascii_digit);
        if digits > 0 {
            i = j + digits;
        }
    }
    i + usize::from(matches!(
        at(i),
        Some(b'l' | b'L' | b'f' | b'F' | b'd' | b'D')
    ))
}

fn number(lit: &str) -> Option<Tok> {
    if let Some(hex) = lit.strip_prefix("0x").or_else(|| lit.strip_prefix("0X")) {
        let hex = hex.trim_end_matches(['l', 'L']);
        return i64::from_str_radix(hex, 16).ok().map(Tok::Long);
    }
    let approximate = lit.contains(['.', 'e', 'E']) || lit.ends_with(['f', 'F', 'd', 'D']);
    let digits = lit.trim_end_matches(['l', 'L', 'f', 'F', 'd', 'D']);
    if approximate {
        digits.parse::<f64>().ok().map(Tok::Double)
    } else {
        // Too large for a long: an approximate number, as Java's selectors read it.
        digits
            .parse::<i64>()
            .map(Tok::Long)
            .or_else(|_| digits.parse::<f64>().map(Tok::Double))
            .ok()
    }
}
