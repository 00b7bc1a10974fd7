package store

// WindowCandidatesSQL lets tests EXPLAIN the placement window's candidate statement.
var WindowCandidatesSQL = windowCandidatesSQL
