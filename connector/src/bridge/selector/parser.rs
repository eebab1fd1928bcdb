//! Selector grammar (JMS message selectors, a subset of SQL-92 conditional expressions):
//!
//! ```text
//! or      = and *( OR and )
//! and     = not *( AND not )
//! not     = NOT not / test
//! test    = sum [ cmp-op sum / [NOT] BETWEEN sum AND sum / [NOT] IN "(" literal *("," literal) ")"
//!                / [NOT] LIKE string [ESCAPE string] / IS [NOT] NULL ]
//! sum     = product *( ("+" / "-") product )
//! product = unary *( ("*" / "/") unary )
//! unary   = ("+" / "-") unary / primary
//! primary = literal / identifier / "(" or ")"
//! ```
//!
//! Every node counts against [`MAX_NODES`] and every nesting level against [`MAX_DEPTH`], so
//! no text makes the parser recurse or allocate without bound.

use super::lexer::{Keyword, Tok, Token};
use super::{Arith, Cmp, Expr, Literal, SelectorError, MAX_DEPTH, MAX_NODES};

/// Parses the tokens of a selector into one expression.
pub fn parse(tokens: &[Token]) -> Result<Expr, SelectorError> {
    let mut p = Parser {
        tokens,
        pos: 0,
        nodes: 0,
        depth: 0,
    };
    let e = p.or()?;
    match p.peek() {
        Tok::End => Ok(e),
        _ => Err(p.unexpected()),
    }
}

struct Parser<'a> {
    tokens: &'a [Token],
    pos: usize,
    nodes: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        self.tokens.get(self.pos).map_or(&Tok::End, |t| &t.kind)
    }

    fn peek_at(&self, n: usize) -> &Tok {
        self.tokens.get(self.pos + n).map_or(&Tok::End, |t| &t.kind)
    }

    fn at(&self) -> usize {
        self.tokens.get(self.pos).map_or(0, |t| t.at)
    }

    fn bump(&mut self) -> Tok {
        let t = self.peek().clone();
        self.pos += 1;
        t
    }

    fn unexpected(&self) -> SelectorError {
        let shown = match self.peek() {
            Tok::End => return SelectorError::at(self.at(), "unexpected end"),
            Tok::Ident(s) => s.clone(),
            Tok::Str(s) => format!("'{s}'"),
            Tok::Long(n) => n.to_string(),
            Tok::Double(d) => d.to_string(),
            Tok::Keyword(k) => format!("{k:?}").to_ascii_uppercase(),
            Tok::Punct(p) => (*p).to_string(),
        };
        SelectorError::token(self.at(), &shown, "unexpected token")
    }

    fn node(&mut self, e: Expr) -> Result<Expr, SelectorError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(SelectorError::at(
                self.at(),
                "selector too complex (more than 64 nodes)",
            ));
        }
        Ok(e)
    }

    fn keyword(&mut self, k: Keyword) -> bool {
        if self.peek() == &Tok::Keyword(k) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn punct(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Tok::Punct(q) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, p: &str) -> Result<(), SelectorError> {
        if self.punct(p) {
            Ok(())
        } else {
            Err(self.unexpected())
        }
    }

    fn nested<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, SelectorError>,
    ) -> Result<T, SelectorError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(SelectorError::at(self.at(), "selector nested too deeply"));
        }
        let r = f(self);
        self.depth -= 1;
        r
    }

    fn or(&mut self) -> Result<Expr, SelectorError> {
        let mut e = self.and()?;
        while self.keyword(Keyword::Or) {
            let r = self.and()?;
            e = self.node(Expr::Or(Box::new(e), Box::new(r)))?;
        }
        Ok(e)
    }

    fn and(&mut self) -> Result<Expr, SelectorError> {
        let mut e = self.not()?;
        while self.keyword(Keyword::And) {
            let r = self.not()?;
            e = self.node(Expr::And(Box::new(e), Box::new(r)))?;
        }
        Ok(e)
    }

    fn not(&mut self) -> Result<Expr, SelectorError> {
        if self.keyword(Keyword::Not) {
            let e = self.nested(Self::not)?;
            return self.node(Expr::Not(Box::new(e)));
        }
        self.test()
    }

    fn test(&mut self) -> Result<Expr, SelectorError> {
        let left = self.sum()?;
        let cmp = match self.peek() {
            Tok::Punct("=") => Some(Cmp::Eq),
            Tok::Punct("<>") => Some(Cmp::Ne),
            Tok::Punct("<") => Some(Cmp::Lt),
            Tok::Punct("<=") => Some(Cmp::Le),
            Tok::Punct(">") => Some(Cmp::Gt),
            Tok::Punct(">=") => Some(Cmp::Ge),
            _ => None,
        };
        if let Some(op) = cmp {
            self.pos += 1;
            let right = self.sum()?;
            return self.node(Expr::Compare(op, Box::new(left), Box::new(right)));
        }
        if self.keyword(Keyword::Is) {
            let negated = self.keyword(Keyword::Not);
            if !self.keyword(Keyword::Null) {
                return Err(self.unexpected());
            }
            let e = self.node(Expr::IsNull(Box::new(left)))?;
            return self.negate(e, negated);
        }
        let negated = matches!(
            (self.peek(), self.peek_at(1)),
            (
                Tok::Keyword(Keyword::Not),
                Tok::Keyword(Keyword::Between | Keyword::In | Keyword::Like)
            )
        );
        if negated {
            self.pos += 1;
        }
        let e = if self.keyword(Keyword::Between) {
            let low = self.sum()?;
            if !self.keyword(Keyword::And) {
                return Err(self.unexpected());
            }
            let high = self.sum()?;
            self.node(Expr::Between(Box::new(left), Box::new(low), Box::new(high)))?
        } else if self.keyword(Keyword::In) {
            self.expect_punct("(")?;
            let mut items = vec![self.literal()?];
            while self.punct(",") {
                items.push(self.literal()?);
            }
            self.expect_punct(")")?;
            self.nodes += items.len();
            self.node(Expr::In(Box::new(left), items))?
        } else if self.keyword(Keyword::Like) {
            let pattern = self.string()?;
            let escape = if self.keyword(Keyword::Escape) {
                let at = self.at();
                let e = self.string()?;
                let mut chars = e.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) => Some(c),
                    _ => {
                        return Err(SelectorError::token(
                            at,
                            &format!("'{e}'"),
                            "escape must be one character",
                        ))
                    }
                }
            } else {
                None
            };
            let like = super::Like::new(&pattern, escape);
            self.node(Expr::Like(Box::new(left), like))?
        } else {
            return Ok(left);
        };
        self.negate(e, negated)
    }

    fn negate(&mut self, e: Expr, negated: bool) -> Result<Expr, SelectorError> {
        if negated {
            self.node(Expr::Not(Box::new(e)))
        } else {
            Ok(e)
        }
    }

    fn string(&mut self) -> Result<String, SelectorError> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.unexpected()),
        }
    }

    fn literal(&mut self) -> Result<Literal, SelectorError> {
        let negative = self.punct("-");
        let lit = match self.peek().clone() {
            Tok::Str(s) if !negative => Literal::Str(s),
            Tok::Long(n) => Literal::Long(if negative { n.wrapping_neg() } else { n }),
            Tok::Double(d) => Literal::Double(if negative { -d } else { d }),
            Tok::Keyword(Keyword::True) if !negative => Literal::Bool(true),
            Tok::Keyword(Keyword::False) if !negative => Literal::Bool(false),
            _ => return Err(self.unexpected()),
        };
        self.pos += 1;
        Ok(lit)
    }

    fn sum(&mut self) -> Result<Expr, SelectorError> {
        self.arithmetic([("+", Arith::Add), ("-", Arith::Sub)], Self::product)
    }

    fn product(&mut self) -> Result<Expr, SelectorError> {
        self.arithmetic([("*", Arith::Mul), ("/", Arith::Div)], Self::unary)
    }

    /// A left-associative chain of `operand`s joined by the operators of `ops`.
    fn arithmetic(
        &mut self,
        ops: [(&str, Arith); 2],
        operand: fn(&mut Self) -> Result<Expr, SelectorError>,
    ) -> Result<Expr, SelectorError> {
        let mut e = operand(self)?;
        while let Some(op) = ops.iter().find(|(p, _)| self.punct(p)).map(|(_, op)| *op) {
            let r = operand(self)?;
            e = self.node(Expr::Arith(op, Box::new(e), Box::new(r)))?;
        }
        Ok(e)
    }

    fn unary(&mut self) -> Result<Expr, SelectorError> {
        if self.punct("-") {
            let e = self.nested(Self::unary)?;
            return self.node(Expr::Negate(Box::new(e)));
        }
        if self.punct("+") {
            return self.nested(Self::unary);
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, SelectorError> {
        let e = match self.peek().clone() {
            Tok::Punct("(") => {
                self.pos += 1;
                let e = self.nested(Self::or)?;
                self.expect_punct(")")?;
                return Ok(e);
            }
            Tok::Ident(name) => Expr::Ident(name),
            Tok::Str(s) => Expr::Literal(Literal::Str(s)),
            Tok::Long(n) => Expr::Literal(Literal::Long(n)),
            Tok::Double(d) => Expr::Literal(Literal::Double(d)),
            Tok::Keyword(Keyword::True) => Expr::Literal(Literal::Bool(true)),
            Tok::Keyword(Keyword::False) => Expr::Literal(Literal::Bool(false)),
            Tok::Keyword(Keyword::Null) => Expr::Literal(Literal::Null),
            _ => return Err(self.unexpected()),
        };
        self.bump();
        self.node(e)
    }
}
