"""Write the book's page of hints, book/hints.md, from annotated_transformer/course/hints.toml."""

from annotated_transformer.course.hints import book_page
from annotated_transformer.layout import ROOT

(ROOT / "book" / "hints.md").write_text(book_page(), encoding="utf-8")
