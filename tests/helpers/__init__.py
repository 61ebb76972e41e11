"""What the tests share: generated inputs (`inputs`), the CLI runner (`cli`), tiny-model
fixtures (`*_fixtures`), naive references (`reference`) and old collection schemas
(`old_schemas`). Test modules import from here, never from another test module
(tests/test_test_helpers.py checks it)."""
