package store

// WindowSQL lets tests EXPLAIN the placement window's statement.
var WindowSQL = windowSQL
