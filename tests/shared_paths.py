"""Where the project's real data lives: ``../shared/data`` beside the repository."""

from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CHEST_XRAY = SHARED_DATA / "chest-xray"
BANK_MARKETING = SHARED_DATA / "bank-marketing" / "bank-full.csv"
