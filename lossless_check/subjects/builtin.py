"""Names of the built-in generator families, importable before torch (the CLI checks names first)."""

BUILTIN_GENERATORS = (
    "AssistedCandidateGenerator",
    "AssistedCandidateGeneratorDifferentTokenizers",
    "UniversalSpeculativeDecodingGenerator",
    "PromptLookupCandidateGenerator",
    "EarlyExitCandidateGenerator",
    "SinglePositionMultiTokenCandidateGenerator",
    "MTPCandidateGenerator",
    "DFlashTokenCandidateGenerator",
)
