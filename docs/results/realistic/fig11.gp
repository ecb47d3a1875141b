set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set linetype 1 linecolor rgb '#0072b2' linewidth 2 pointtype 5
set linetype 2 linecolor rgb '#d55e00' linewidth 2 pointtype 6
set linetype 3 linecolor rgb '#009e73' linewidth 2 pointtype 7
set linetype 4 linecolor rgb '#cc79a7' linewidth 2 pointtype 8
set linetype 5 linecolor rgb '#56b4e9' linewidth 2 pointtype 9
set linetype 6 linecolor rgb '#e69f00' linewidth 2 pointtype 10
set linetype 7 linecolor rgb '#000000' linewidth 2 pointtype 11
set linetype 8 linecolor rgb '#999999' linewidth 2 pointtype 12
set linetype cycle 8
set output 'docs/results/realistic/fig11.png'
set title 'fig11'
set xlabel 'load (share of estimated capacity)'
set ylabel 'mean TPOT (ms)'
$d0 << EOD
0.2 6.87611
0.4 10.9252
0.6 13.0366
0.8 14.0473
0.95 14.4697
EOD
$d1 << EOD
0.2 6.33902
0.4 10.8308
0.6 13.0112
0.8 14.0296
0.95 14.4761
EOD
$d2 << EOD
0.2 6.29216
0.4 10.8368
0.6 13.0205
0.8 14.0356
0.95 14.4784
EOD
$d3 << EOD
0.2 6.43986
0.4 10.8454
0.6 13.0246
0.8 14.0421
0.95 14.4868
EOD
$d4 << EOD
0.2 6.50338
0.4 9.80417
0.6 11.6865
0.8 12.6889
0.95 13.1191
EOD
$d5 << EOD
0.2 6.86878
0.4 10.9399
0.6 12.9646
0.8 13.9097
0.95 14.2929
EOD
plot $d0 using 1:2 with linespoints title 'random', $d1 using 1:2 with linespoints title 'rr', $d2 using 1:2 with linespoints title 'jsq', $d3 using 1:2 with linespoints title 'p2c', $d4 using 1:2 with linespoints title 'eldr', $d5 using 1:2 with linespoints title 'eldr-permuted'
